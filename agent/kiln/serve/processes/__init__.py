"""The plan's processes: how they are assembled and launched (children or systemd units), and kept alive."""
