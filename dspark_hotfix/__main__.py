from dspark_hotfix.cli import main

raise SystemExit(main())
