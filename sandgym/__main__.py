from sandgym.cli import main

main()
