from memo_exec.calibrate.command import main

if __name__ == "__main__":
    main()
