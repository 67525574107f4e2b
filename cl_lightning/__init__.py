"""cl_lightning: continual learning from a stream with PyTorch Lightning."""

__version__ = "0.1.0"
