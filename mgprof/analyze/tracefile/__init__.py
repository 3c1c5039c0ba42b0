"""One trace file read into one rank's compact arrays: decode, reduce, split, health."""
