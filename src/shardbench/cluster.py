"""Joining several processes into one JAX program (jax.distributed), and agreeing across them.

A process joins when it is told where the coordinator is (flags or SHARDBENCH_* variables, which is what
`shardbench launch` sets) or when JAX recognises the cluster it runs in (SLURM, Cloud TPU, Open MPI, ...).
After joining, processes compare their configurations and report each stage's outcome to each other through
the coordinator's key-value store, so that a failure in one process stops all of them with its message
instead of leaving the others waiting in a collective.

JAX is imported by the functions that call it, not at the top: `shardbench launch` and the command line's parser
read this module's settings without starting JAX.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from shardbench import errors
from shardbench.devices import check_split
from shardbench.errors import ClusterError, ConfigError, ShardbenchError

ENV_COORDINATOR = "SHARDBENCH_COORDINATOR"
ENV_NUM_PROCESSES = "SHARDBENCH_NUM_PROCESSES"
ENV_PROCESS_ID = "SHARDBENCH_PROCESS_ID"
ENV_LOCAL_DEVICES = "SHARDBENCH_LOCAL_DEVICES"  # simulated CPU devices in each process (set by the launcher)
ENV_JOIN_TIMEOUT = "SHARDBENCH_JOIN_TIMEOUT"
DEFAULT_JOIN_TIMEOUT_S = 120
DEFAULT_HEARTBEAT_TIMEOUT_S = 60
# Planning may download and decode a dataset on one host while another has it cached: the others wait this
# long for it. A process that died meanwhile is noticed sooner, by JAX's heartbeat.
SLOW_STAGE_TIMEOUT_S = 3600

T = TypeVar("T")


@dataclass(frozen=True)
class Cluster:
    """How this process joins: explicit (coordinator, count, id) or detected by JAX (coordinator None)."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    local_devices: int = 0  # simulated CPU devices of this process; 0 = --devices / processes
    join_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S
    detected: str = ""  # the name of the cluster JAX recognised, when nothing was given

    def describe(self) -> str:
        if self.detected:
            return f"{self.detected} cluster"
        return f"coordinator {self.coordinator}"


def _int(value: str | None, what: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{what} must be an integer, got {value!r}") from None


def resolve(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
            join_timeout_s: int | None = None, environ: Mapping[str, str] | None = None) -> Cluster | None:
    """The cluster this process should join: flags first, then SHARDBENCH_* variables, then what JAX detects;
    None for a run of one process. Checks everything that can be checked without a network."""
    env = os.environ if environ is None else environ
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _int(env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _int(env.get(ENV_PROCESS_ID), ENV_PROCESS_ID)
    if join_timeout_s is None:
        join_timeout_s = _int(env.get(ENV_JOIN_TIMEOUT), ENV_JOIN_TIMEOUT) or DEFAULT_JOIN_TIMEOUT_S
    local = _int(env.get(ENV_LOCAL_DEVICES), ENV_LOCAL_DEVICES) or 0
    if join_timeout_s <= 0:
        raise ConfigError(f"--join-timeout must be a positive number of seconds, got {join_timeout_s}")
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    if all(v is None for v in given.values()):
        detected = detect()
        if detected is None:
            return None
        return Cluster(None, None, None, local, join_timeout_s, detected=detected)
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ConfigError(f"joining several processes needs --coordinator, --num-processes and --process-id "
                          f"(or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}); missing: "
                          f"{', '.join(missing)}")
    assert coordinator is not None and num_processes is not None and process_id is not None
    if not re.fullmatch(r"\[?[\w.:-]+\]?:\d{1,5}", coordinator):
        raise ConfigError(f"--coordinator {coordinator!r} is not HOST:PORT (for example 10.0.0.1:1234)")
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be at least 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id {process_id} is out of range for {num_processes} processes: use 0 to "
                          f"{num_processes - 1}")
    if num_processes == 1:
        return None
    return Cluster(coordinator, num_processes, process_id, local, join_timeout_s)


def detect() -> str | None:
    """The cluster environment JAX would join by itself (SLURM with several tasks, a Cloud TPU pod slice,
    Open MPI, ...), or None. Reads JAX's own list, so it knows what the installed JAX knows."""
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError:  # a JAX without the list: only explicit joining
        return None
    for env in ClusterEnv._cluster_types:
        if env.opt_in_only_method:
            continue
        try:
            if env.is_env_present() and env.get_process_count() > 1:
                return getattr(env, "name", "") or env.__name__
        except Exception:  # a half-configured environment is not a cluster to join
            continue
    return None


def local_device_count(cluster: Cluster, total: int) -> int:
    """Simulated CPU devices for this process: the launcher's count, else the run's --devices split evenly."""
    if cluster.local_devices:
        return cluster.local_devices
    if total <= 0:
        return 0
    n = cluster.num_processes or 1
    check_split(total, n, 0)
    return total // n


def join(cluster: Cluster, cpu_devices: int = 0) -> None:
    """Start jax.distributed for this process; CPU processes talk through gloo. Must run before any other
    JAX call. Fails in bounded time (the join timeout) with a message naming the process and coordinator:
    JAX itself aborts the process with a stack trace when joining times out, so a watchdog speaks first."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption service takes SIGTERM for a sync point that shardbench never asks about: a joined process
    # ignored SIGTERM (a launch's stop, a scheduler's) and ran on until SIGKILL came.
    jax.config.update("jax_enable_preemption_service", False)
    if cpu_devices > 0:
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    if cluster.process_id == 0 and _on_loopback(cluster.coordinator):
        _check_port_free(cluster)
    global _join_timeout_s
    _join_timeout_s = cluster.join_timeout_s
    joined = threading.Event()
    watchdog = threading.Thread(target=_watch_join, args=(cluster, joined), daemon=True)
    watchdog.start()
    try:
        jax.distributed.initialize(
            coordinator_address=cluster.coordinator, num_processes=cluster.num_processes,
            process_id=cluster.process_id, initialization_timeout=cluster.join_timeout_s + JOIN_MARGIN_S,
            heartbeat_timeout_seconds=DEFAULT_HEARTBEAT_TIMEOUT_S,
            # Given explicitly, it is taken as given: inside SLURM, JAX's detection would otherwise also
            # narrow each process to one device (its task's local id).
            cluster_detection_method="deactivate" if cluster.coordinator else None,
            # A coordinator on loopback listens there only (JAX's default is every interface).
            coordinator_bind_address=cluster.coordinator if _on_loopback(cluster.coordinator) else None,
        )
    except Exception as err:  # jax raises RuntimeError/ValueError with multi-line text for bad arguments
        first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        raise ClusterError(f"{_who(cluster)} could not join the {cluster.describe()}: {first[:200]}") from None
    finally:
        joined.set()
    errors.end_at_once_on_failure()  # a failing process must not wait in JAX's shutdown barrier for the others


JOIN_MARGIN_S = 15  # JAX's own join deadline comes this much after ours, so ours is the message people see


def _check_port_free(cluster: Cluster) -> None:
    """Process 0's coordinator port on loopback, tried before JAX binds it: JAX's own failure there is a line of
    gRPC, and at times a segmentation fault."""
    host, _, port = (cluster.coordinator or "").rpartition(":")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as err:
            raise ClusterError(f"process 0 could not start the coordinator at {cluster.coordinator}: "
                               f"{err.strerror or err} (is port {port} in use? launch --port 0 picks a free "
                               f"one)") from None


def _on_loopback(coordinator: str | None) -> bool:
    """Whether HOST:PORT names this host's loopback interface (127.0.0.0/8, ::1 or localhost)."""
    if not coordinator:
        return False
    host = coordinator.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _who(cluster: Cluster) -> str:
    return "this process" if cluster.process_id is None else f"process {cluster.process_id}"


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _watch_join(cluster: Cluster, joined: threading.Event) -> None:
    """Until joined: look at the coordinator's port now and then; at the join timeout, say what went wrong
    in one line and end the process (exit 5) before JAX's own deadline aborts it with a stack trace."""
    deadline = time.monotonic() + cluster.join_timeout_s
    seen = False
    while not joined.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.0))):
        if cluster.coordinator and not seen:
            seen = _reachable(cluster.coordinator)
        if time.monotonic() < deadline:
            continue
        if cluster.coordinator is None:
            why = "the cluster's other processes did not all join"
        elif cluster.process_id == 0:
            why = f"not all {cluster.num_processes} processes joined its coordinator at {cluster.coordinator}"
        elif not seen:
            why = f"nothing answered at {cluster.coordinator} (is process 0 running, and is that its address?)"
        else:
            why = f"the coordinator at {cluster.coordinator} answered but not every process joined"
        print(f"shardbench: error: {_who(cluster)} could not join the run within {cluster.join_timeout_s} s: "
              f"{why}; start all {cluster.num_processes or 'the'} processes with the same --coordinator and "
              f"--num-processes (or raise --join-timeout)", file=sys.stderr, flush=True)
        os._exit(5)


def is_joined() -> bool:
    try:
        from jax._src import distributed
    except ImportError:
        return False
    return distributed.global_state.client is not None


# ------------------------------------------------------------------------------------ talking between processes
_round = 0  # one key prefix per exchange, so a process that exchanges several times never reads a stale value
_join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S  # how long an exchange waits by default: the joined cluster's


def _client() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def exchange(value: str, timeout_s: float | None = None) -> list[str]:
    """Every process's `value`, in process order (just [value] for one process). Needs no compilation.

    A process that does not send in time (it failed before getting here, or took another path) raises a
    ClusterError naming it."""
    import jax

    global _round
    _round += 1
    if jax.process_count() == 1 or not is_joined():
        return [value]
    client = _client()
    me = jax.process_index()
    timeout = timeout_s if timeout_s is not None else _join_timeout_s
    client.key_value_set(f"shardbench/{_round}/{me}", value)
    values = []
    for p in range(jax.process_count()):
        try:
            values.append(client.blocking_key_value_get(f"shardbench/{_round}/{p}", int(timeout * 1000)))
        except Exception:
            raise ClusterError(f"process {p} did not report within {timeout:g} s: it failed or stopped before "
                               f"this point (see its output)") from None
    return values


def agree(stage: str, fn: Callable[[], T], timeout_s: float | None = None) -> T:
    """Run `fn` in every process and continue only if it succeeded in all of them; otherwise every process
    raises the first failing process's error (one process's bad data must not leave the others waiting).
    `timeout_s` bounds the wait for a process still busy with `fn` (default: the join timeout)."""
    import jax

    error: Exception | None = None
    result: T | None = None
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001 - any failure must reach the others, or they wait for it
        error = err
    if jax.process_count() == 1 or not is_joined():
        if error is not None:
            raise error
        return result  # type: ignore[return-value]
    shared = None if error is None else as_shardbench_error(error)
    outcomes = [json.loads(v) for v in exchange(json.dumps(
        {"ok": shared is None, "kind": type(shared).__name__ if shared else "", "message": str(shared or "")}),
        timeout_s)]
    for p, outcome in enumerate(outcomes):
        if not outcome["ok"]:
            if p == jax.process_index() and error is not None:
                raise errors.mark_agreed(error)
            raise errors.mark_agreed(_rebuild(outcome["kind"], f"process {p} failed at {stage}: {outcome['message']}"))
    return result  # type: ignore[return-value]


def as_shardbench_error(err: Exception) -> ShardbenchError:
    """`err` as the other processes are told of it: itself, a fault of a file or the system as its one line
    (`errors.describe_fault`), anything else (a bug) as a ClusterError naming its type."""
    if isinstance(err, ShardbenchError):
        return err
    fault = errors.describe_fault(err)
    if fault is not None:
        return fault
    return ClusterError(f"internal error: {type(err).__name__}: {errors.one_line(err)}")


def _rebuild(kind: str, message: str) -> ShardbenchError:
    """The same error class another process raised, so the exit code means the same thing everywhere."""
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, ShardbenchError)):
        cls = ClusterError
    return cls(message)


def check_same(flat: Mapping[str, Any], what: str = "configuration") -> None:
    """Stop every process when they were started with different configurations, naming the first field."""
    import jax

    text = json.dumps(dict(flat), sort_keys=True, default=str)
    mine = json.loads(text)  # as the others see it (tuples become lists)
    me = jax.process_index()
    for p, theirs in enumerate(json.loads(t) for t in exchange(text)):
        differing = [k for k in sorted(set(theirs) | set(mine)) if theirs.get(k) != mine.get(k)]
        if not differing:
            continue
        key = differing[0]
        values = {p: theirs.get(key), me: mine.get(key)}
        first, second = sorted((p, me))
        raise errors.mark_agreed(ConfigError(
            f"the processes were started with different {what}s: process {first} has {key}={values[first]!r} "
            f"but process {second} has {values[second]!r}; start every process with the same arguments"
        ))


def gather_json(value: Any) -> list[Any]:
    """Every process's JSON-able `value`, in process order."""
    return [json.loads(v) for v in exchange(json.dumps(value, default=str))]
