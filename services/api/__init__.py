"""The HTTP api: a thin FastAPI shell over `openbook.Classifier` and the example log."""
