"""The turn lifecycle: submission, the runner's loop, slots, cancellation, suspend/resume, context
assembly and start-up recovery of what a crash left of turns.
"""
