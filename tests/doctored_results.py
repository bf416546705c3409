"""Rows a test puts into a part's results file after the part wrote it (a variant no registry
knows, to see how the notebooks show it), written as the suite's writer would have: the record's
digest of the rows is renewed, so the loader takes them as the part's own."""

import hashlib
import json
from pathlib import Path

import pandas as pd

from harness.results import ROWS_DIGEST, provenance_path


def rewrite_rows(path: Path, frame: pd.DataFrame) -> None:
    frame.to_csv(path, index=False)
    record = provenance_path(path)
    data = json.loads(record.read_text())
    data[ROWS_DIGEST] = hashlib.sha256(path.read_bytes()).hexdigest()
    record.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
