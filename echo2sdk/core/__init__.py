"""The stable core: records, buffer, capacity, learner, coordinator, worker. Imports nothing from adapters/ or backends/."""
