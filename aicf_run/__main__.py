from aicf_run.cli import main

main()
