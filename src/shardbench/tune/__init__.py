"""`shardbench tune`: plan every layout, measure the best few within a budget, report predicted against measured."""
