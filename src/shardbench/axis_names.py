"""The logical axis names: the words models name their arrays' dimensions with ('batch', 'embed', 'heads', ...),
and that strategies map onto mesh axes (`shardbench.parallel.strategies`). Plain strings, in a module of their own
that imports nothing: the strategies' table, which the command line reads for its choices and help, is data too.
"""

from __future__ import annotations

Axes = tuple[str | None, ...]

BATCH = "batch"
SEQ = "seq"
# The sequence dim of the residual stream, where LayerNorm and dropout work (MaxText's activation_norm_length): a
# name of its own so that sequence parallelism can split it over the model axis while the matmuls' inputs (SEQ)
# stay whole there; every other strategy maps it as SEQ.
NORM_SEQ = "norm_seq"
EMBED = "embed"  # model width: the residual stream and one side of every kernel
MLP = "mlp"  # hidden width of the feed-forward block
HEADS = "heads"  # attention heads
KV = "kv"  # per-head width
LAYERS = "layers"  # the stacked-layer dimension that a scan runs over
NORM = "norm"  # LayerNorm scale and bias: small, never worth sharding
CLASSES = "classes"  # output classes (or vocabulary)
PATCH = "patch"  # flattened pixels of one patch
VOCAB = "vocab"  # token ids of a language model's embedding and output head
FEATURES = "features"  # input features of a model fed vectors (the MLP)
EXPERT = "expert"  # a mixture's experts: their stacked parameters, and the tokens dispatched to them
