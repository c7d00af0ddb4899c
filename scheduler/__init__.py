"""slotsched: who gets the next warm slot, who waits, and who yields."""
