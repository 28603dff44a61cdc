from timeline.cli import main; import sys; sys.exit(main())
