"""One trainer per task: add_arguments(parser) and run(args) -> metrics. See solutions.train."""
