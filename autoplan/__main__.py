from autoplan.cli import run

run()
