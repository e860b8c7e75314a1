"""Op sharding rules: for an op and its input layouts, the output layouts (possibly partial) and
the input layouts the op requires. ``infer(op, layouts, shapes, **attrs)`` applies one; an op with
no rule is an error. One module per op family; importing this package registers them all.
"""
from . import (attention, elementwise, embedding, kv_cache, loss, matmul, mla, moe, normalization,  # noqa: F401
               reduction, rotary, shape, slicing)
from .common import make_layout
from .elementwise import broadcast_rule
from .registry import (LocalKernel, NoRuleError, RuleError, RuleResult, get_rule, infer, register_rule,
                       registered_ops)

__all__ = ["LocalKernel", "NoRuleError", "RuleError", "RuleResult", "broadcast_rule", "get_rule", "infer",
           "make_layout", "register_rule", "registered_ops"]
