target_sources(gcz PRIVATE)
