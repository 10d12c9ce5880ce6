"""Pure cost formulas: FLOPs, activation bytes, kernel times, collectives, host transfers."""
