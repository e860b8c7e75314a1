"""mindformers_core: the MindFormers parallel core as a pure-Python MindSpore extension."""
__version__ = "0.1.0"

from . import distributed  # noqa: E402
from .distributed import DeviceMesh, RankGenerator, get_mesh, init_distributed, set_mesh  # noqa: E402

__all__ = ["DeviceMesh", "RankGenerator", "distributed", "get_mesh", "init_distributed", "set_mesh"]
