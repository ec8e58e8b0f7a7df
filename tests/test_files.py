"""files.write_atomically: the whole new file, or the old one."""

import pytest

from transformer.files import write_atomically


def test_write_replaces_the_file_whole_and_a_failed_write_leaves_the_old_one(tmp_path):
  path = tmp_path / "config.json"
  write_atomically(path, "first\n")
  write_atomically(path, "zweite Fassung\n")
  assert path.read_text(encoding="utf-8") == "zweite Fassung\n"
  write_atomically(path, b"\x00bytes")
  assert path.read_bytes() == b"\x00bytes"
  with pytest.raises(TypeError):
    write_atomically(path, ["not", "text"])  # fails before anything is renamed
  assert path.read_bytes() == b"\x00bytes"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
