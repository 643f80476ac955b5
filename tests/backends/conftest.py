"""The fixtures of the backends' private servers that more than one file may use."""

from ._tansu import memory_broker, s3_broker  # noqa: F401
