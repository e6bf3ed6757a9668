from toolatlas.cli import main

raise SystemExit(main())
