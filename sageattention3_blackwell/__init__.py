"""sageattention3_blackwell: FP4 microscaling attention (SageAttention3 style) for Blackwell GPUs.

``sageattn3_blackwell(q, k, v, is_causal=...)`` runs the FP4 kernels on sm_100 (B200) and
sm_120/121 (RTX 50-series) GPUs; :mod:`sageattention3_blackwell.emulation` is the same scheme in
plain torch (the kernels' test oracle, and a slow fallback on any device). Shipped in the
``sageattention`` wheel; see README.md.
"""

from sageattention import __version__  # one wheel, one version (and sageattention's build check)

from . import emulation
from .api import UnsupportedDeviceError, sageattn3_blackwell

__all__ = ["sageattn3_blackwell", "emulation", "UnsupportedDeviceError", "__version__"]
