"""``nox -s releases``: every ExecuTorch release in range against the baseline (explore), the release
table and bisection (_table), and the upgrade-path report (_upgrade_path)."""
