"""Triton kernels with their wrappers, and the dense reference.

`lab.backend` is imported first so that TRITON_INTERPRET is set before Triton loads.
"""

import lab.backend  # noqa: F401  (must run before `import triton`)
