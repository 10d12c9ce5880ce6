from memo_sim.cli import main

if __name__ == "__main__":
    main()
