"""Build script.

Today the package is pure Python: the Triton kernels are compiled at run time, so nothing
is built here. The compiled CUDA kernels (csrc/, a later step) will be optional extensions
added here, and SAGEATTN_SKIP_CUDA_BUILD=1 will skip them, giving this same package.
"""

from setuptools import setup

setup()
