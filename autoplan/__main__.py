from autoplan.cli import main

raise SystemExit(main())
