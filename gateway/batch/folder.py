"""File contents on disk, one file per id in the files folder (private to this user, like the data dir).

Written to a temporary name and renamed, so a reader never sees half a file and a replica killed while writing
leaves no file under the id; the store's record is written after the content, and deleted before it.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path

SAFE_ID = re.compile(r"file-[A-Za-z0-9_-]{1,64}")


class FileFolder:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _of(self, file_id: str) -> Path:
        if not SAFE_ID.fullmatch(file_id):  # ids are ours; anything else never names a path
            raise ValueError(f"not a file id: {file_id[:80]!r}")
        return self.path / file_id

    async def write(self, file_id: str, content: bytes) -> None:
        await asyncio.to_thread(self._write, self._of(file_id), content)

    def _write(self, target: Path, content: bytes) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    async def read(self, file_id: str) -> bytes | None:
        path = self._of(file_id)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None

    async def delete(self, file_id: str) -> None:
        self._of(file_id).unlink(missing_ok=True)
