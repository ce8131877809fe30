"""Communication per step per device: every collective in a compiled (SPMD-partitioned) HLO module.

Two byte figures per collective, both per device per step: the payload, the collective's buffer (an
all-reduce's buffer, an all-gather's gathered output, a reduce-scatter's input, an all-to-all's or a
collective-permute's buffer), and the bytes one device sends on a ring of the op's group of N devices:
2(N-1)/N x the payload for an all-reduce, (N-1)/N for an all-gather, reduce-scatter or all-to-all
(`sent_fraction`). A collective-permute is sent by the source devices of its source-target pairs alone, its
whole buffer once per pair (a device in no pair as source sends nothing: XLA may split one shift into
complementary permutes, each run by some of the devices), so its bytes sent differ between devices; the figure
is the fullest device's, its permutes' buffers summed over every execution in which it sends them
(`fullest_sent`), which is what a step waits on. Payloads do not compare across kinds: data parallelism's
all-reduce of S bytes of gradients has a payload of S, ZeRO's reduce-scatter and all-gather of the same
gradients 2S, while each device sends 2(N-1)/N x S in both.

Collectives inside a `while` body (the layer scan) run once per iteration, so counts are multiplied
by the loop's known trip count, recursively from the entry computation; a loop whose trip count is not known
is counted once, and `CommsReport.unknown_trip_counts` says how many such loops held a collective.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from shardbench.measure.run_record import Collective

if TYPE_CHECKING:
    import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1,
    "f8e4m3fnuz": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_CALLEES = re.compile(r"\b(?:body|to_apply|calls|branch_computations)=\{?([%\w.\-, ]+)\}?")
_NUM_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")
_REPLICA_COUNT = re.compile(r"\breplica_count=(\d+)")


def sent_fraction(kind: str, n: int) -> float:
    """Bytes one device sends per byte of payload, for a collective of `kind` over a group of `n` devices on a
    ring: an all-reduce (a reduce-scatter, then an all-gather) 2(n-1)/n, a collective-permute its whole buffer
    (from a device that is a source of one of its pairs: `CollectiveOp.sent_by_device`), an all-gather,
    reduce-scatter or all-to-all (n-1)/n; nothing in a group of one."""
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2.0 * (n - 1) / n
    if kind == "collective-permute":
        return 1.0
    return (n - 1) / n


@dataclass(frozen=True)
class CollectiveOp:
    """One collective instruction: how often it runs per step, its payload per device per run, the groups of
    devices (logical ids, in the program's device assignment) that exchange data (None where XLA gave none:
    every device in one group), and the size of its group."""

    kind: str
    count: int
    bytes_each: int
    groups: tuple[tuple[int, ...], ...] | None
    group_size: int = 1

    @property
    def sent_each(self) -> float:
        """Bytes one device sends per run on a ring of its group (`sent_fraction`); for a collective-permute, one
        that is the source of one of its pairs (`sent_by_device`)."""
        return self.bytes_each * sent_fraction(self.kind, self.group_size)

    def sent_by_device(self) -> dict[int, int] | None:
        """A collective-permute's bytes sent per run by each device that sends: its buffer once for every
        source-target pair the device is the source of; a device that is no pair's source sends nothing and is
        left out. None for every other kind, whose every device sends `sent_each`, and for a permute whose pairs
        the HLO did not give (then counted as sent by every device, as the other kinds are)."""
        if self.kind != "collective-permute" or self.groups is None:
            return None
        sent: dict[int, int] = {}
        for pair in self.groups:
            if pair:
                sent[pair[0]] = sent.get(pair[0], 0) + self.bytes_each
        return sent


def fullest_sent(ops: Iterable[CollectiveOp], devices: int = 1) -> tuple[int, int]:
    """Bytes that `ops` send per step: (the fullest device's, every device's together over `devices`). Each op
    counts its executions x its bytes sent per run: a collective-permute on each source device of its pairs
    (`CollectiveOp.sent_by_device`), every other op the same on every device (rounded per op, as the record
    always has). A device's total is summed over the ops before the largest is taken, so two complementary
    permutes (each device the source in one) count one buffer per device, not two."""
    everyone = 0
    by_device: dict[int, int] = {}
    for op in ops:
        sent = op.sent_by_device()
        if sent is None:
            everyone += round(op.count * op.sent_each)
            continue
        for device, b in sent.items():
            by_device[device] = by_device.get(device, 0) + op.count * b
    return (everyone + max(by_device.values(), default=0),
            everyone * devices + sum(by_device.values()))


@dataclass
class CommsReport:
    """What a compiled module communicates per step: per kind, the record's own `Collective` (executions,
    payload and bytes sent per device), and every instruction with its device groups."""

    by_kind: dict[str, Collective] = field(default_factory=dict)
    unknown_trip_counts: int = 0  # loops holding a collective whose trip count XLA did not record: counted once
    ops: list[CollectiveOp] = field(default_factory=list)  # every collective instruction, for link assignment

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes or 0 for c in self.by_kind.values())

    @property
    def total_sent_bytes(self) -> int:
        return sum(c.sent_bytes or 0 for c in self.by_kind.values())

    @property
    def total_count(self) -> int:
        return sum(c.count or 0 for c in self.by_kind.values())

    def add(self, op: CollectiveOp) -> None:
        """One more instruction: its executions per step and payload added to its kind's; the kind's bytes sent
        are its fullest device's over all its instructions so far (`fullest_sent`: every device sends alike but
        in a collective-permute, whose instructions alone are counted again together)."""
        self.ops.append(op)
        c = self.by_kind.get(op.kind, Collective(count=0, bytes=0, sent_bytes=0))
        sent = (fullest_sent(o for o in self.ops if o.kind == op.kind)[0] if op.kind == "collective-permute"
                else (c.sent_bytes or 0) + fullest_sent([op])[0])
        self.by_kind[op.kind] = replace(c, count=(c.count or 0) + op.count,
                                        bytes=(c.bytes or 0) + op.count * op.bytes_each, sent_bytes=sent)


def shape_bytes(shape_text: str) -> list[int]:
    """Bytes of every array shape in `shape_text` (a tuple shape gives several)."""
    sizes = []
    for dtype, dims in _SHAPE.findall(shape_text):
        if dtype not in _DTYPE_BYTES:
            continue
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        sizes.append(count * _DTYPE_BYTES[dtype])
    return sizes


@dataclass
class _Instruction:
    name: str
    shape: str
    opcode: str
    rest: str


def _computations(hlo: str) -> tuple[dict[str, list[_Instruction]], str | None]:
    comps: dict[str, list[_Instruction]] = {}
    entry: str | None = None
    current: list[_Instruction] | None = None
    for line in hlo.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m and "=" not in line.split("{")[0].split("(")[0]:
                current = comps.setdefault(m.group(1), [])
                if line.startswith("ENTRY"):
                    entry = m.group(1)
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTRUCTION.match(line)
        if m:
            current.append(_Instruction(*m.groups()))
    return comps, entry


def _kind(opcode: str) -> str | None:
    base = opcode.removesuffix("-start")
    return base if base in KINDS else None


def _tuple_elements(shape_text: str) -> list[str]:
    """Top-level elements of a tuple shape '(a, (b, c), d)'; a non-tuple shape is its own single element."""
    text = shape_text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, current = [], 0, ""
    for ch in text[1:-1]:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        current += ch
    return [p for p in (*parts, current) if p.strip()]


def _payload(inst: _Instruction, kind: str, shapes: dict[str, str]) -> int:
    """Per-device payload: the larger of operand and result (gathered output, scattered input)."""
    result = shape_bytes(inst.shape)
    if inst.opcode.endswith("-start") and kind != "all-reduce":
        # Async results are (operands, outputs[, context scalars]): an all-gather's or collective-permute's
        # outputs (the gathered buffer), a reduce-scatter's operands (the buffer before it is scattered).
        elements = _tuple_elements(inst.shape)
        if len(elements) < 2:
            return sum(result)
        return sum(shape_bytes(elements[0 if kind == "reduce-scatter" else 1]))
    total = sum(result)
    if kind == "reduce-scatter":
        operands = re.findall(r"%([\w.\-]+)", inst.rest.split(")")[0])
        total = max(total, sum(sum(shape_bytes(shapes.get(o, ""))) for o in operands))
    return total


_GROUPS = re.compile(r"replica_groups=(\{[{}0-9, ]*\}|\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)")
_PAIRS = re.compile(r"source_target_pairs=(\{[{}0-9, ]*\})")


def _iota_ids(text: str) -> np.ndarray:
    """XLA's iota list '[d0,d1,...]T(p...)': arange(prod d) reshaped to d, transposed by p (when given),
    flattened: the device ids in that order."""
    import numpy as np

    dims_text, _, perm_text = text.partition("T")
    dims = [int(v) for v in dims_text.strip("[]").split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    return (ids.transpose([int(v) for v in perm_text.strip("()").split(",")]) if perm_text else ids).ravel()


def _iota_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """XLA's iota form '[G,S]<=[d0,d1,...]T(p...)': the iota list (`_iota_ids`) reshaped to G groups of S."""
    shape_text, _, rest = text.partition("<=")
    groups = int(shape_text.strip("[]").split(",")[0])
    return tuple(tuple(int(i) for i in row) for row in _iota_ids(rest).reshape(groups, -1))


# XLA's mesh-axes form (jit's collectives under Shardy): the mesh's axes and sizes, its device ids where they are
# not 0..N-1 in order (an iota '[d0,d1]T(p)' or a list), then the axes a group spans, each whole or a sub-axis
# 'name':(pre)size: replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]"
                          r"(?:,\s*device_ids=\((\[[0-9,]+\](?:T\([0-9,]+\))?|[{}0-9, ]+)\))?\s*\{([^}]*)\}")
_MESH_AXIS = re.compile(r"'?([^'=,\s]+)'?=(\d+)")
_GROUP_AXIS = re.compile(r"'?([^':,\s]+)'?(?::\((\d+)\)(\d+))?")


def _mesh_groups(axes_text: str, ids_text: str | None, group_text: str) -> tuple[tuple[int, ...], ...] | None:
    """The groups of XLA's mesh-axes form, as XLA expands it (`MeshAxesReplicaGroupList`): the device ids laid out
    over the mesh's axes, each grouped axis reshaped to (pre, size, rest) where it is a sub-axis, the grouped
    parts moved last in the order given, then every run of `group size` ids one group. None where a part is not
    in a form read here (the op is then taken as spanning every device of the module)."""
    import numpy as np

    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(axes_text)]
    names = [name for name, _ in axes]
    refs = [(name, int(pre) if pre else None, int(size) if size else None)
            for name, pre, size in _GROUP_AXIS.findall(group_text) if name]
    if not axes or (not refs and group_text.strip()) or any(name not in names for name, _, _ in refs):
        return None
    total = math.prod(size for _, size in axes)
    if ids_text is None:
        ids = np.arange(total)
    elif ids_text.startswith("["):
        ids = _iota_ids(ids_text)
    else:
        ids = np.array([int(v) for v in re.findall(r"\d+", ids_text)])
    if ids.size != total:
        return None
    dims, grouped = [], []
    for name, size in axes:
        subs = sorted((pre, part) for ref_name, pre, part in refs if ref_name == name and pre is not None)
        whole = any(ref_name == name and pre is None for ref_name, pre, _ in refs)
        if whole:
            grouped.append((refs.index((name, None, None)), len(dims)))
            dims.append(size)
            continue
        done = 1
        for pre, part in subs:  # (pre, size, rest): a sub-axis is the middle part of its axis's index
            if pre != done:
                dims.append(pre // done)
                done = pre
            grouped.append((refs.index((name, pre, part)), len(dims)))
            dims.append(part)
            done *= part
        if done != size or not subs:
            dims.append(size // done)
    # No axis ('{}'): every device alone, a collective that moves nothing.
    order = [d for d in range(len(dims)) if d not in {g for _, g in grouped}] + [g for _, g in sorted(grouped)]
    if math.prod(dims) != total:
        return None
    size = math.prod(dims[g] for _, g in grouped)
    return tuple(tuple(int(i) for i in row) for row in ids.reshape(dims).transpose(order).reshape(-1, size))


def device_groups(attributes: str) -> tuple[tuple[int, ...], ...] | None:
    """The device groups of a collective from its HLO attributes: `replica_groups` in the explicit
    ({{0,1},{2,3}}), iota ([2,2]<=[4]) or mesh-axes (mesh['axis_0'=2,'axis_1'=2] {'axis_0'}) form, or a
    collective-permute's source-target pairs."""
    mesh = _MESH_GROUPS.search(attributes)
    if mesh:
        return _mesh_groups(*mesh.groups())
    found = _GROUPS.search(attributes) or _PAIRS.search(attributes)
    if found is None:
        return None
    text = found.group(1)
    if text.startswith("["):
        return _iota_groups(text)
    groups = tuple(tuple(int(v) for v in inner.split(",") if v.strip())
                   for inner in re.findall(r"\{([0-9, ]*)\}", text))
    return tuple(g for g in groups if g) or None


_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_BOUND = re.compile(r"^[su](?:32|64)\[\]")


def trip_count(inst: _Instruction, comps: dict[str, list[_Instruction]]) -> int | None:
    """How often a `while` runs: XLA's known_trip_count where it recorded one (the CPU and GPU compilers do),
    else the integer bound of a condition in the form JAX's loops (scan, fori_loop) lower to, `counter < bound`
    with the counter from 0 (the TPU compiler records no count), else None: a loop of another form (`<=`, a
    bound first, a count down) is of unknown length rather than guessed."""
    known = _TRIP.search(inst.rest)
    if known:
        return int(known.group(1))
    condition = _CONDITION.search(inst.rest)
    body = comps.get(condition.group(1), []) if condition else []
    bounds = {i.name: int(m.group(1)) for i in body if i.opcode == "constant" and _BOUND.match(i.shape.strip())
              for m in [re.match(r"\s*(-?\d+)\)", i.rest)] if m}
    compares = [i for i in body if i.opcode == "compare"]
    if len(bounds) != 1 or len(compares) != 1 or "direction=LT" not in compares[0].rest:
        return None
    [(name, bound)] = bounds.items()
    operands = re.match(r"\s*([^)]*)\)", compares[0].rest)
    second = operands.group(1).split(",")[-1].split()[-1].lstrip("%") if operands else ""
    return bound if second == name.lstrip("%") and bound > 0 else None


def module_devices(hlo: str) -> int:
    """The devices a module runs on, from its header: num_partitions x replica_count (XLA's default for
    either, when the header leaves it out, is 1)."""
    header = next((line for line in hlo.splitlines() if line.startswith("HloModule")), "")
    partitions, replicas = _NUM_PARTITIONS.search(header), _REPLICA_COUNT.search(header)
    return (int(partitions.group(1)) if partitions else 1) * (int(replicas.group(1)) if replicas else 1)


def group_size(groups: tuple[tuple[int, ...], ...] | None, devices: int) -> int:
    """Devices in one group of a collective: its first replica group's, or every device of the module where
    XLA gave no groups."""
    return len(groups[0]) if groups else devices


def count_collectives(hlo: str) -> CommsReport:
    """Collectives of a compiled module, each counted as often as it executes in one call."""
    comps, entry = _computations(hlo)
    report = CommsReport()
    if entry is None:
        return report
    devices = module_devices(hlo)
    holding: dict[str, bool] = {}

    def holds_collective(name: str, depth: int = 0) -> bool:
        """Whether computation `name`, or one it calls, runs a collective: a loop of unknown length without one
        leaves every count exact (a ring attention's loops over key tiles hold none)."""
        if name not in holding:
            holding[name] = False  # a computation reached again while it is being read adds nothing
            insts = comps.get(name, []) if depth <= 64 else []
            holding[name] = any(_kind(i.opcode) is not None for i in insts) or any(
                holds_collective(n.strip().lstrip("%"), depth + 1)
                for i in insts for m in _CALLEES.finditer(i.rest) for n in m.group(1).split(",") if n.strip())
        return holding[name]

    def visit(name: str, times: int, depth: int) -> None:
        if depth > 64 or name not in comps:
            return
        insts = comps[name]
        shapes = {i.name: i.shape for i in insts}
        for inst in insts:
            kind = _kind(inst.opcode)
            if kind is not None:
                groups = device_groups(inst.rest)
                report.add(CollectiveOp(kind, times, _payload(inst, kind, shapes), groups,
                                        group_size(groups, devices)))
            callees = [n.strip().lstrip("%") for m in _CALLEES.finditer(inst.rest) for n in m.group(1).split(",")]
            if not callees:
                continue
            trips = 1
            if inst.opcode == "while":
                found = trip_count(inst, comps)
                if found is not None:
                    trips = found
                elif any(holds_collective(callee) for callee in callees if callee):
                    report.unknown_trip_counts += 1
            for callee in callees:
                if callee:
                    visit(callee, times * trips, depth + 1)

    visit(entry, 1, 0)
    return report


def crosses_only(groups: tuple[tuple[int, ...], ...] | None, sizes: tuple[int, ...], axis: int) -> bool:
    """Whether a collective-permute's source-target pairs all cross mesh axis `axis` alone: the same coordinates
    on the other axes, another on this one (device ids taken as positions in the mesh's row-major order, `sizes`,
    as jit assigns them)."""
    import numpy as np

    def along(pair: tuple[int, ...]) -> bool:
        if len(pair) != 2 or max(pair) >= int(np.prod(sizes)):
            return False
        a, b = np.unravel_index(pair[0], sizes), np.unravel_index(pair[1], sizes)
        return all((x != y) == (i == axis) for i, (x, y) in enumerate(zip(a, b)))

    return bool(groups) and all(map(along, groups or ()))


def along_one_axis(ops: list[CollectiveOp], sizes: tuple[int, ...], axis: int) -> Collective:
    """The collective-permutes that move data along mesh axis `axis` alone (pipeline stages: activations one stage
    on, their gradients one stage back; `crosses_only`). Executions and bytes per device per step, as
    `Collective`s count every kind: the payload their buffers, bytes sent the fullest device's (`fullest_sent`)."""
    moving = [op for op in ops if op.kind == "collective-permute" and crosses_only(op.groups, sizes, axis)]
    return Collective(count=sum(op.count for op in moving), bytes=sum(op.count * op.bytes_each for op in moving),
                      sent_bytes=fullest_sent(moving)[0])


_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_NOT_KERNELS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast"})


_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")


_LAYOUT = re.compile(r"\{[^{}]*\}")


def _operands(inst: _Instruction) -> list[str]:
    """The operand names of an instruction (layouts such as {1,0:T(8,128)} removed first: their parentheses
    would end the operand list early)."""
    return re.findall(r"%([\w.\-]+)", _LAYOUT.sub("", inst.rest).split(")")[0])


def _bytes(shape: str) -> int:
    return sum(shape_bytes(shape))


def _moved(inst: _Instruction, shapes: dict[str, str], comps: dict[str, list[_Instruction]]) -> int:
    """Bytes one instruction reads and writes. A dynamic slice reads its slice, not the buffer; a dynamic
    update slice writes its update in place; inside a fusion, the same holds for each of its parameters and
    for its root (so that a scanned layer reading its weights from the stacked array counts one layer)."""
    operands = _operands(inst)
    if inst.opcode == "dynamic-slice":
        return 2 * _bytes(inst.shape)
    if inst.opcode == "dynamic-update-slice" and len(operands) > 1:
        return 2 * _bytes(shapes.get(operands[1], ""))
    callee = _CALLS.search(inst.rest) if inst.opcode == "fusion" else None
    body = comps.get(callee.group(1), []) if callee else []
    if not body:
        return _bytes(inst.shape) + sum(_bytes(shapes.get(o, "")) for o in operands)
    inner = {i.name: i for i in body}
    users: dict[str, list[_Instruction]] = {}
    for i in body:
        for o in _operands(i):
            users.setdefault(o, []).append(i)
    read = 0
    for i in body:
        if i.opcode != "parameter":
            continue
        index = int(re.match(r"\s*(\d+)", i.rest).group(1)) if re.match(r"\s*(\d+)", i.rest) else -1
        outer = _bytes(shapes.get(operands[index], "")) if 0 <= index < len(operands) else _bytes(i.shape)
        uses = users.get(i.name, [])
        if uses and all(u.opcode == "dynamic-slice" and _operands(u)[0] == i.name for u in uses):
            read += sum(_bytes(u.shape) for u in uses)
        elif uses and all(u.opcode == "dynamic-update-slice" and _operands(u)[0] == i.name for u in uses):
            continue  # the buffer updated in place: its update is counted as written
        else:
            read += outer
    root = body[-1]  # HLO text ends a computation with its ROOT
    roots = [inner.get(o) for o in _operands(root)] if root.opcode == "tuple" else [root]
    written = 0
    for r in roots:
        if r is not None and r.opcode == "dynamic-update-slice" and len(_operands(r)) > 1:
            update = inner.get(_operands(r)[1])
            written += _bytes(update.shape) if update is not None else 0
        elif r is not None:
            written += _bytes(r.shape)
    return read + written


def executed(hlo: str) -> tuple[int, int]:
    """What one call of the compiled module executes: (kernels, bytes read and written).

    Kernels: instructions outside fusions (a fusion counts once), roughly the kernels a step launches, for
    the per-kernel cost the planner fits. Bytes: every executed top-level instruction's operands and result
    (a fusion's, not its insides'; see `_moved` for slices). A loop body counts as often as it runs, where
    XLA's own cost analysis counts it once and so undercounts layers under a scan by the layer count."""
    comps, entry = _computations(hlo)

    def visit(name: str, times: int, depth: int) -> tuple[int, int]:
        if depth > 64 or name not in comps:
            return 0, 0
        insts = comps[name]
        shapes = {i.name: i.shape for i in insts}
        kernels = traffic = 0
        for inst in insts:
            if inst.opcode == "while":
                body = _BODY.search(inst.rest)
                if body:
                    k, t = visit(body.group(1), times * (trip_count(inst, comps) or 1), depth + 1)
                    kernels, traffic = kernels + k, traffic + t
                continue
            if inst.opcode in _NOT_KERNELS:
                continue
            kernels += times
            traffic += times * _moved(inst, shapes, comps)
        return kernels, traffic

    return visit(entry, 1, 0) if entry else (0, 0)
