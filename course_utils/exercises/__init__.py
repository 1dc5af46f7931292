"""Exercises with instant feedback, one module per chapter: ``from course_utils.exercises.ch01 import
q1``, then ``q1.check(answer)``, ``q1.hint()`` (the next hint) and ``q1.solution()``."""
