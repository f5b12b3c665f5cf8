"""Technique 4: Karmarkar-Karp batch balancing hidden behind compute."""
