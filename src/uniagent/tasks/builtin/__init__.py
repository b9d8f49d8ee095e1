"""Task suites bundled with uniagent: data files only (starter SWE tasks, search QA)."""
