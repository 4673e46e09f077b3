"""The evaluation protocol: the runner (the parent's phase order), the trusted process, the candidate's child (the
only importer of a submission), what they say to each other and how they exchange data, the timed windows and the
judging. How a child is confined (its uid, cgroup, limits, pause) is harness.sandbox's."""
