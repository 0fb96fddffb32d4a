"""ibmon: InfiniBand fabric monitoring daemon."""

__version__ = "0.1.0"
__all__ = ["__version__"]
