import sys

try:
    from benchmarks.cli import main
except ImportError as exc:  # a base install: the benchmarks need the bench extras
    missing = getattr(exc, "name", None) or str(exc)
    print(f"python -m benchmarks needs the bench extras ({missing} is not installed): "
          "pip install -e '.[bench]'", file=sys.stderr)
    raise SystemExit(2) from None

raise SystemExit(main())
