from memo_sim.cli import main

main()
