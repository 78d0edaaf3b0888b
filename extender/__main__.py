"""``python -m extender``: same as the ``gpufrac`` console script."""

from extender.cli import main

raise SystemExit(main())
