from experiments import startup

if startup.started_as_training_command():
    startup.hold()  # a Ctrl-C during the imports stops the run after them (experiments/startup.py)
    startup.import_the_library()
