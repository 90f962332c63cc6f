"""The capture directory: JSONL files rotated by size, capped in count, deleted past retention.

Files are named `capture-<UTC time>-<sequence>.jsonl`, so name order is age
order. Only files of that shape are ever rotated or deleted. Blocking file
I/O: the capture stage calls this from a worker thread.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PREFIX = "capture-"
SUFFIX = ".jsonl"


class CaptureFiles:
    def __init__(self, directory: str | os.PathLike[str], max_file_bytes: int, max_files: int,
                 retention_days: float) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.retention_s = retention_days * 86400
        self.current: Path | None = None
        self.sequence = 0

    def files(self) -> list[Path]:
        """The capture files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir()
                      if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX) and p.is_file())

    def append(self, lines: list[str]) -> None:
        """Append whole lines; a file that would grow past the size limit is closed first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        current = self.current
        if current is None or not current.exists() or current.stat().st_size + len(data) > self.max_file_bytes:
            current = self.current = self._new_file()
        fd = os.open(current, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # prompts: owner only
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.prune()

    def prune(self, now: float | None = None) -> list[Path]:
        """Delete files past retention and the oldest past the count cap; the deleted files."""
        now = time.time() if now is None else now
        files = self.files()
        old = [p for p in files if now - p.stat().st_mtime > self.retention_s]
        kept = [p for p in files if p not in old]
        doomed = old + kept[:max(0, len(kept) - self.max_files)]
        for path in doomed:
            path.unlink(missing_ok=True)
        return doomed

    def _new_file(self) -> Path:
        self.sequence += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return self.directory / f"{PREFIX}{stamp}-{os.getpid()}-{self.sequence:06d}{SUFFIX}"
