from aicfc.cli import main

main()
