"""The emulated backend: every primitive on real mesh-factorized storage, with the C++ core
for collectives, GEMM and flash attention and numpy for the rest.

An implementation takes storages (numpy arrays, or Python scalars where a primitive allows
constants) and returns the list of output storages. Work on an invariant value is done once:
mesh dims of size 1 broadcast like any other dim.

One module per op family (elementwise, reductions, structural, contractions, attention,
collectives, fallback), each registering its implementations beside their definitions.
"""

import warnings

# JAX computes log(0), 1/0 and overflow quietly (inf, nan); numpy would warn from this package's
# ufunc calls. A filter costs nothing until a warning happens, unlike np.errstate per call.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"shardlab\._src\.backends\.emulated")

from . import elementwise  # noqa: E402,F401
from . import reductions  # noqa: E402,F401
from . import structural  # noqa: E402,F401
from . import contractions  # noqa: E402,F401
from . import attention  # noqa: E402,F401
from . import collectives  # noqa: E402,F401
from . import fallback  # noqa: E402,F401
