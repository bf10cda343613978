"""``python -m dsv4lab.replay --compile-lesson OUT.json [--stage S4] [--indexer]``: the torch.compile
lesson in a child process of the replay (compile_lesson.run_compile_lesson starts it)."""
import argparse

from .compile_lesson import compile_lesson


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsv4lab.replay")
    p.add_argument("--compile-lesson", required=True, help="write the torch.compile lesson's JSON here")
    p.add_argument("--stage", default="S4")
    p.add_argument("--indexer", action="store_true", help="compile the stage's indexer top-k too")
    a = p.parse_args(argv)
    compile_lesson(a.compile_lesson, a.stage, indexer=a.indexer)


if __name__ == "__main__":
    main()
