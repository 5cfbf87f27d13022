"""lit-liger: faster, leaner LitGPT training on GPUs with Triton kernels.

    from lit_liger import LigerCallback, LigerConfig, apply_liger, chunked_cross_entropy
"""

from .apply import apply_liger
from .swap.adapter import remove_liger
from .swap.report import LigerReport
from .callback import LigerCallback
from .config import LigerConfig
from .swap.loss import LigerLogits, chunked_cross_entropy

__version__ = "0.1.0"
__all__ = [
    "LigerCallback",
    "LigerConfig",
    "LigerLogits",
    "LigerReport",
    "apply_liger",
    "chunked_cross_entropy",
    "remove_liger",
]
