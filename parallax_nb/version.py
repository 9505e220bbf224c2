"""The package's version, in a leaf module so that any room can name it without importing the package face."""

__version__ = "0.1.0"
