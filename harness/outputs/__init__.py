"""What a person reads: the figures (:mod:`.plots`), the extrapolation report (:mod:`.report`) and the
baseline gate (:mod:`.compare`)."""
