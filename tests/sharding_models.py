"""Small models parallelized only by ``shard()`` declarations, shared by the sharding tests."""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindformers_core.sharding import Layout


def mesh(config):
    return Layout((config["dp"], 1, config["tp"]), ("dp", "cp", "tp"))


def _init(shape, seed):
    return Tensor(np.random.RandomState(seed).standard_normal(shape).astype(np.float32) * 0.2)


class Linear(nn.Cell):
    """x @ W with W (in, out); declares what ``declare(config)`` returns."""
    sharding_op = "linear"
    sharding_params = ("weight",)

    def __init__(self, i, o, seed, declare=None):
        super().__init__()
        self.weight = Parameter(_init((i, o), seed), name="weight")
        self.declare = declare

    def sharding_attrs(self):
        return {"transpose_b": False}

    def construct(self, x):
        return ops.matmul(x, self.weight)

    def shard(self, config):
        return self.declare(config) if self.declare else None


def column(i, o, seed):
    return Linear(i, o, seed, lambda c: (None, None, {"weight": mesh(c)("None", "tp")}))


def row(i, o, seed, sequence_parallel=False):
    def declare(c):
        m = mesh(c)
        out = m("dp", "tp", "None") if sequence_parallel else m("dp", "None", "None")
        return m("dp", "None", "tp"), out, m("tp", "None")
    return Linear(i, o, seed, declare)


class RMSNorm(nn.Cell):
    sharding_op = "rms_norm"
    sharding_params = ("weight",)

    def __init__(self, h, sequence_parallel=False):
        super().__init__()
        self.weight = Parameter(Tensor(np.linspace(0.5, 1.5, h).astype(np.float32)), name="weight")
        self.sequence_parallel = sequence_parallel

    def sharding_attrs(self):
        return {"epsilon": 1e-6}

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-6) * self.weight

    def shard(self, config):
        if not self.sequence_parallel:
            return None
        m = mesh(config)
        return m("dp", "tp", "None"), m("dp", "tp", "None"), None


class MLP(nn.Cell):
    """Column then row: the classic Megatron MLP."""

    def __init__(self, h=8, f=32, seed=0, sequence_parallel=False):
        super().__init__()
        self.fc1 = column(h, f, seed)
        self.fc2 = row(f, h, seed + 1, sequence_parallel)

    def construct(self, x):
        return self.fc2(ops.gelu(self.fc1(x)))


class Attention(nn.Cell):
    """Heads split over tp by the column q/k/v, merged by the row projection; the attention core
    is plain ops on local heads."""

    def __init__(self, h=16, heads=4, seq=8, seed=10, sequence_parallel=False):
        super().__init__()
        self.head_dim = h // heads
        self.linear_q = column(h, h, seed)
        self.linear_k = column(h, h, seed + 1)
        self.linear_v = column(h, h, seed + 2)
        self.linear_proj = row(h, h, seed + 3, sequence_parallel)
        mask = np.triu(np.full((seq, seq), -1e9, np.float32), 1)
        self.mask = Tensor(mask.reshape(1, 1, seq, seq))
        self.scale = 1.0 / np.sqrt(self.head_dim)

    def construct(self, x):
        q, k, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)
        b, s, _ = q.shape   # from q, not x: x may arrive sequence-sharded and q gathered
        q = ops.transpose(q.reshape(b, s, -1, self.head_dim), (0, 2, 1, 3))
        k = ops.transpose(k.reshape(b, s, -1, self.head_dim), (0, 2, 1, 3))
        v = ops.transpose(v.reshape(b, s, -1, self.head_dim), (0, 2, 1, 3))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.scale + self.mask
        ctx = ops.matmul(ops.softmax(scores, axis=-1), v)
        return self.linear_proj(ops.transpose(ctx, (0, 2, 1, 3)).reshape(b, s, -1))


class Block(nn.Cell):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, h=16, heads=4, seq=8, sequence_parallel=False):
        super().__init__()
        self.norm1 = RMSNorm(h, sequence_parallel)
        self.attention = Attention(h, heads, seq, sequence_parallel=sequence_parallel)
        self.norm2 = RMSNorm(h, sequence_parallel)
        self.mlp = MLP(h, 4 * h, seed=20, sequence_parallel=sequence_parallel)

    def construct(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SequenceParallelMLP(nn.Cell):
    """A norm declared sequence-sharded feeding a column linear: propagation must all-gather the
    sequence at the linear's boundary (and reduce-scatter its gradient)."""

    def __init__(self, h=8):
        super().__init__()
        self.norm = RMSNorm(h, sequence_parallel=True)
        self.mlp = MLP(h, 4 * h, seed=5, sequence_parallel=True)

    def construct(self, x):
        return x + self.mlp(self.norm(x))


class WithLoss(nn.Cell):
    """``mean(model(x) * target)``: a scalar whose gradient reaches every weight."""

    def __init__(self, model, target_shape):
        super().__init__()
        self.model = model
        self.target = Tensor(np.random.RandomState(99).standard_normal(target_shape).astype(np.float32))

    def construct(self, x):
        return (self.model(x) * self.target).mean()


MODELS = {
    "mlp": lambda: (WithLoss(MLP(), (4, 8, 8)), (4, 8, 8)),
    "attention": lambda: (WithLoss(Attention(), (4, 8, 16)), (4, 8, 16)),
    "block": lambda: (WithLoss(Block(), (4, 8, 16)), (4, 8, 16)),
    "block_sp": lambda: (WithLoss(Block(sequence_parallel=True), (4, 8, 16)), (4, 8, 16)),
    "sp_mlp": lambda: (WithLoss(SequenceParallelMLP(), (4, 8, 8)), (4, 8, 8)),
}


class PlainAttentionMLP(nn.Cell):
    """A model with no shard() anywhere, built from MindSpore's nn.Dense (weight (out, in)):
    parallelized from outside by a plan of styles."""

    def __init__(self, h=16, heads=4, seq=8):
        super().__init__()
        self.head_dim = h // heads
        self.q = nn.Dense(h, h, has_bias=False)
        self.k = nn.Dense(h, h, has_bias=False)
        self.v = nn.Dense(h, h, has_bias=False)
        self.o = nn.Dense(h, h, has_bias=False)
        self.norm = RMSNorm(h)
        self.up = nn.Dense(h, 4 * h, has_bias=True, activation="relu")   # activation inside the Cell
        self.down = nn.Dense(4 * h, h, has_bias=False)
        for i, d in enumerate((self.q, self.k, self.v, self.o, self.up, self.down)):
            d.weight.set_data(_init(tuple(d.weight.shape), 40 + i))
        # nn.Dense draws its bias from MindSpore's global RNG: set it, or the reference model, the
        # parallelized copy and every rank each get a different bias
        self.up.bias.set_data(_init(tuple(self.up.bias.shape), 50))
        self.mask = Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1).reshape(1, 1, seq, seq))
        self.scale = 1.0 / np.sqrt(self.head_dim)

    def construct(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        b, s, _ = q.shape
        q = ops.transpose(q.reshape(b, s, -1, self.head_dim), (0, 2, 1, 3))
        k = ops.transpose(k.reshape(b, s, -1, self.head_dim), (0, 2, 1, 3))
        v = ops.transpose(v.reshape(b, s, -1, self.head_dim), (0, 2, 1, 3))
        p = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.scale + self.mask, axis=-1)
        x = x + self.o(ops.transpose(ops.matmul(p, v), (0, 2, 1, 3)).reshape(b, s, -1))
        return x + self.down(self.up(self.norm(x)))


def plain_plan(sequence_parallel=False):
    from mindformers_core.sharding.styles import ColWiseParallel, RowWiseParallel, SequenceParallel
    out = "sequence" if sequence_parallel else "replicate"
    plan = {"q": ColWiseParallel(), "k": ColWiseParallel(), "v": ColWiseParallel(),
            "o": RowWiseParallel(output=out), "up": ColWiseParallel(), "down": RowWiseParallel(output=out)}
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    return plan


MODELS["plain"] = lambda: (WithLoss(PlainAttentionMLP(), (4, 8, 16)), (4, 8, 16))
