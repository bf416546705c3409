"""``python -m workloads TOPIC --part P --scale S --out FILE``: measure one part (harness.entry)."""

from harness.entry import main

if __name__ == "__main__":
    main()
