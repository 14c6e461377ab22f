from openai_compat.cli import main

if __name__ == "__main__":
    main()
