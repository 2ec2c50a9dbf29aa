"""Triton kernels with their wrappers, and the dense reference.

`kernels.backend` is imported first so that TRITON_INTERPRET is set before Triton loads.
"""

import kernels.backend  # noqa: F401  (must run before `import triton`)
