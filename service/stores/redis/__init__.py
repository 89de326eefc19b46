"""The Redis session store (``RedisStore``, in ``store``) and its parts."""

from service.stores.redis.connection import StoreUnavailable
from service.stores.redis.store import RedisStore

__all__ = ["RedisStore", "StoreUnavailable"]
