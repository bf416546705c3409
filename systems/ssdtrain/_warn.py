"""Warnings attributed to the user's line, not to a frame of torch, of a library or of this package.

SSDTrain warns from hooks that torch calls (a block's forward hook, an unpack in backward, the
``with`` block's exit through ``contextlib``): a fixed ``stacklevel`` points at torch's files from
some of them, or past the user's frame from others. ``warn`` counts the frames up to the first
outside torch, this package, ``contextlib`` and installed packages (transformers' model code calls
the blocks of a Hugging Face model).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import torch

_LIBRARY_FILES = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep)


def _library(filename: str) -> bool:
    # Installed packages too: a Hugging Face model's forward (transformers') calls the blocks.
    installed = f"{os.sep}site-packages{os.sep}" in filename or f"{os.sep}dist-packages{os.sep}" in filename
    return installed or filename.startswith(_LIBRARY_FILES) or filename == contextlib.__file__


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message)`` at the first calling frame outside the libraries (the outermost
    frame where every one is theirs: a thread of their own)."""
    frame, level = sys._getframe(1), 2  # stacklevel 2: warn's caller
    while frame.f_back is not None and _library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
