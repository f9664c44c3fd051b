"""The graph IR and the errors every layer of mcuforge imports: the ground floor. Nothing here
imports any other part of mcuforge."""
