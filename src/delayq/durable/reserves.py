"""Where a backend's faces find the shared reserves of a backend that fires ahead, under
one name per face (the generated sync face imports the twin of the asyncio one's)."""

from ._async.hold import AsyncReserves
from ._sync.hold import Reserves

__all__ = ["AsyncReserves", "Reserves"]
