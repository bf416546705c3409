"""One line, not a traceback, for what the user can fix (harness/errors.py)."""

import pytest

from harness.errors import UserError, exit_on_user_error


def failing(err: BaseException):
    @exit_on_user_error
    def main():
        raise err

    return main


def test_a_user_error_is_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as stop:
        failing(UserError("the config names no such part"))()
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: the config names no such part\n"


@pytest.mark.parametrize(
    "err, words",
    [
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10485760000000 bytes."),
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 10485760000000 bytes.",
        ),
        (MemoryError(), "MemoryError"),
    ],
)
def test_an_allocation_a_config_asks_for_and_cannot_have_is_one_line(capsys, err, words):
    """A table or a transfer larger than the machine: the allocator's words, in one line."""
    err.add_note("(raised in part row_sizes)")
    with pytest.raises(SystemExit) as stop:
        failing(err)()
    assert stop.value.code == 2
    line = capsys.readouterr().err
    assert line == (
        f"error: ran out of memory (raised in part row_sizes): {words} (does the config ask for more than this "
        "machine holds?)\n"
    )


def test_a_gpu_out_of_memory_error_is_one_line_too(capsys):
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name, without a GPU
        pass

    with pytest.raises(SystemExit):
        failing(OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB\nmore lines"))()
    assert "ran out of memory: CUDA out of memory. Tried to allocate 80.00 GiB (does" in capsys.readouterr().err


def test_other_errors_keep_their_traceback():
    """A programming error is not the user's to fix from one line: it raises as it is."""
    with pytest.raises(RuntimeError, match="shape mismatch"):
        failing(RuntimeError("shape mismatch"))()
    with pytest.raises(KeyError):
        failing(KeyError("x"))()
