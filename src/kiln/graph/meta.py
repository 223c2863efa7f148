"""Typed metadata attached to graph nodes (``BuildMeta``, as in iree.build), and
the shape of a file's small persistent metadata."""

from __future__ import annotations

from typing import ClassVar, Protocol, TypeVar

BuildMetaType = TypeVar("BuildMetaType", bound="BuildMeta")


class HasMetadata(Protocol):
    """A graph node (``kiln.graph.BuildDependency``): it holds its metadata by key."""

    @property
    def _metadata(self) -> dict[str, BuildMeta]: ...


class BuildMeta:
    """Typed metadata attached to a node; each subclass has a unique ``KEY``."""

    KEY: ClassVar[str]

    def __init__(self) -> None:
        if not isinstance(getattr(self, "KEY", None), str):
            raise TypeError(f"{type(self).__name__}.KEY must be a str")

    @classmethod
    def get(cls: type[BuildMetaType], dep: HasMetadata) -> BuildMetaType:
        """The instance of this type on ``dep``, created by ``create_default`` if absent."""
        key = getattr(cls, "KEY", None)
        if not isinstance(key, str):
            raise TypeError(f"{cls.__name__}.KEY must be a str")
        instance = dep._metadata.get(key)
        if instance is None:
            instance = cls.create_default()
            dep._metadata[key] = instance
        return instance  # type: ignore[return-value]

    @classmethod
    def create_default(cls) -> BuildMeta:
        return cls()


BuildFileMetadata = dict[str, str | int | bool | float]
