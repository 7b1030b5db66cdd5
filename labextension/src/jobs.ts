// The Jobs panel, docked in JupyterLab's main area: launch a multi-node job (Horovod/MPI or
// torchrun) or run a notebook as a job (once with its parameters, or a grid of them as a Slurm array),
// list mine with their state, follow one job's log live with a rank filter, cancel, open a notebook
// job's executed notebook and its runs' results table; a notification when a job ends. A notebook
// can also run on a schedule (Slurm's scrontab): each run is then a job of its own in the list.
// Everything goes through the session's REST API and websocket (portal/session/job/api.py), which
// check each request against the user's launch policy: this panel only offers what may pass.
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';

import { api, sessionUrl, state, streamUrl } from './api';
import { DRIVE } from './jobfiles';

interface Profile {
  name: string;
  display_name: string;
  gpu_choices: number[];
  default_gpus: number;
  jobs: { default_walltime: string };
}

interface Image {
  name: string;
  display_name: string;
  profiles: string[];
}

interface Policy {
  profiles: Profile[];
  default_profile: string;
  images: Image[];
}

export interface Job {
  job_id: number;
  name: string;
  state: string;
  reason: string;
  exit_code: string;
  nodes: number;
  ranks: number;
  image: string | null;
  description: string;
  finished: boolean;
  session: string;
  session_job: number | null;
  from_this_session: boolean;
  kind: string;
  notebook: string | null;
  runs: number;
  run_states: { [run: string]: string };
  schedule: string;
}

/** A notebook run on a schedule (portal/session/job/schedules.py). */
interface Schedule {
  id: string;
  schedule: string;
  words: string;
  next: string | null;
  notebook: string;
  paused: boolean;
  description: string;
  runs: number;
  last_run: number | null;
  problem: string;
}

/** Crontab times offered in the schedule field (any other crontab time may be typed). */
const SCHEDULE_PRESETS: [string, string][] = [
  ['0 2 * * *', 'every day at 02:00'],
  ['0 2 * * 1', 'every Monday at 02:00'],
  ['0 * * * *', 'every hour'],
  ['0 6 1 * *', 'on the 1st of every month at 06:00']
];

interface Results {
  columns: string[];
  rows: { [column: string]: unknown }[];
}

/** A notebook job's notebook, as JupyterLab opens it: read-only, in the jobs' own drive (jobfiles.ts). */
export function jobFile(jobId: number, name: string): string {
  return `${DRIVE}:${jobId}/${name}`;
}

type StreamEvent =
  | { type: 'job'; job: Job }
  | { type: 'line'; rank: number | null; stream: string; line: string }
  | { type: 'state'; state: string; exit_code: string; reason: string };

const REFRESH_MS = 5000;

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: { [key: string]: string } = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === 'text') {
      node.textContent = value;
    } else {
      node.setAttribute(key, value);
    }
  }
  node.append(...children);
  return node;
}

function field(label: string, control: HTMLElement): HTMLLabelElement {
  return element('label', { class: 'dsportal-Jobs-field' }, element('span', { text: label }), control);
}

function option(select: HTMLSelectElement, value: string, text: string): void {
  select.append(element('option', { value, text }));
}

export class JobsPanel extends Widget {
  /** ``open`` opens a file of the session in JupyterLab (the executed notebooks), in a new tab or beside
   * the current one (``mode`` 'split-right'). */
  constructor(open: (path: string, mode?: string) => Promise<unknown> = () => Promise.resolve()) {
    super();
    this._open = open;
    this.id = 'dsportal-jobs';
    this.addClass('dsportal-Jobs');
    this.title.label = 'Jobs';
    this.title.caption = 'Multi-node jobs: launch, follow every rank live, cancel';
    this.title.closable = true;

    const c = this._controls;
    c.script.placeholder = 'train.py or analysis.ipynb (in your home)';
    c.script.required = true;
    c.script.oninput = () => this._showKind();
    c.parameters.placeholder = '{"lr": 0.001}';
    c.grid.placeholder = '{"lr": [0.001, 0.0003], "seed": [1, 2]}';
    c.max_running.type = 'number';
    c.max_running.min = '1';
    c.mail.type = 'checkbox';
    c.nodes.type = 'number';
    c.nodes.min = '1';
    c.nodes.value = '2';
    c.walltime.placeholder = '01:00:00';
    option(c.launcher, 'mpi', 'MPI (Horovod)');
    option(c.launcher, 'torchrun', 'torchrun (torch.distributed)');
    for (const control of Object.values(c)) {
      control.classList.add('jp-mod-styled');
    }
    c.profile.onchange = () => this._showProfile();
    const submit = element('button', { type: 'submit', class: 'jp-Button jp-mod-styled jp-mod-accept', text: 'Launch job' });
    c.schedule.placeholder = 'empty: now; or a crontab time, e.g. 0 2 * * * (every day at 02:00)';
    c.schedule.setAttribute('list', 'dsportal-schedule-presets');
    const presets = element('datalist', { id: 'dsportal-schedule-presets' });
    for (const [value, words] of SCHEDULE_PRESETS) {
      presets.append(element('option', { value, text: words }));
    }
    c.schedule.oninput = () => {
      submit.textContent = c.schedule.value.trim() ? 'Schedule' : 'Launch job';
    };
    this._nodesField = field('Nodes', c.nodes);
    this._launcherField = field('Launcher', c.launcher);
    this._notebookFields = [
      field('Parameters (JSON)', c.parameters),
      field('Grid (JSON: one run per combination)', c.grid),
      field('At most running at once', c.max_running),
      field('E-mail me when it ends', c.mail),
      field('Schedule (Slurm cron)', c.schedule)
    ];
    this._form.append(
      field('Script or notebook', c.script),
      field('Partition profile', c.profile),
      this._nodesField,
      field('GPUs per node', c.gpus_per_node),
      this._launcherField,
      ...this._notebookFields,
      field('Image', c.image),
      field('Walltime', c.walltime),
      element('div', { class: 'dsportal-Jobs-submit' }, submit),
      presets
    );
    this._showKind();
    this._form.onsubmit = event => {
      event.preventDefault();
      void this._launch();
    };
    this._rankFilter.classList.add('jp-mod-styled');
    this._rankFilter.onchange = () => this._applyFilter();
    this._resetFilter(0);

    const table = element(
      'table',
      { class: 'dsportal-Jobs-table' },
      element('thead', {}, element('tr', {}, ...['Job', 'Name', 'State', 'Nodes', 'Ranks', 'Image', 'Session', ''].map(h => element('th', { text: h })))),
      this._rows
    );
    this.node.append(
      element(
        'section',
        {},
        element('h2', { text: 'Launch a job: multi-node, or a notebook' }),
        element(
          'p',
          { class: 'dsportal-Jobs-hint' },
          'One rank per GPU on each node, inside the image if you pick one. In a notebook: ',
          element('code', { text: '%%horovod --nodes 2 --gpus-per-node 2' }),
          ' or ',
          element('code', { text: '%%torchrun --nodes 2 --gpus-per-node 2' }),
          '. A notebook (.ipynb) runs headless on one node: its cell tagged ',
          element('code', { text: 'parameters' }),
          ' takes the values you give, a grid runs once per combination, and what its cell tagged ',
          element('code', { text: 'results' }),
          ' prints as JSON becomes a row of the results table.'
        ),
        this._form,
        this._message
      ),
      element('section', {}, element('h2', { text: 'My jobs' }), element('div', { class: 'dsportal-Jobs-tableScroll' }, table)),
      this._schedulesSection,
      this._results,
      element(
        'section',
        { class: 'dsportal-Jobs-logSection' },
        element('div', { class: 'dsportal-Jobs-logHeader' }, this._logTitle, field('Show', this._rankFilter), this._logState),
        this._log
      )
    );
    this._schedulesSection.append(
      element('h2', { text: 'My schedules' }),
      element(
        'table',
        { class: 'dsportal-Jobs-table dsportal-Jobs-schedules' },
        element('thead', {}, element('tr', {}, ...['Notebook', 'When', 'Next run', 'Runs', ''].map(h => element('th', { text: h })))),
        this._scheduleRows
      )
    );
    this._schedulesSection.hidden = true;
    this._results.hidden = true;
    this._message.setAttribute('role', 'status');
    this._log.setAttribute('aria-live', 'polite');
  }

  /** Fill the form to run this notebook as a job (the file browser's "Run as job"). */
  runNotebook(path: string): void {
    this._controls.script.value = path;
    this._showKind();
    this._controls.script.focus();
    this._say(`Choose the slice for ${path}, and parameters if you like, then Launch job.`, 'info');
  }

  /** Follow one job's log (replayed from its start, then live). */
  follow(jobId: number): void {
    this._socket?.close();
    this._log.textContent = '';
    this._following = jobId;
    for (const row of Array.from(this._rows.rows)) {
      row.classList.toggle('dsportal-mod-following', row.dataset.jobId === String(jobId));
    }
    this._logTitle.textContent = `Log of job ${jobId}`;
    this._logState.textContent = '';
    this._logState.className = 'dsportal-Jobs-logState';
    const known = this._jobs.get(jobId);
    this._resetFilter(known ? known.ranks : 0, known ? known.runs : 0);
    const socket = new WebSocket(streamUrl(jobId));
    this._socket = socket;
    socket.onmessage = message => {
      if (this._socket === socket) {
        this._onEvent(jobId, JSON.parse(message.data) as StreamEvent);
      }
    };
    socket.onerror = () => {
      if (this._socket === socket) {
        this._append(null, 'error', `(the log of job ${jobId} could not be followed: the session's server did not answer)`);
      }
    };
  }

  dispose(): void {
    this._socket?.close();
    window.clearInterval(this._timer);
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (!this._policy) {
      void this._loadPolicy();
    }
    void this.refresh();
    let ticks = 0;
    this._timer = window.setInterval(() => {
      ticks++;
      // Behind another tab, still every 30 s while a job runs: its end is told (a notification) on time.
      const running = Array.from(this._jobs.values()).some(job => !job.finished);
      if (this.isVisible || (running && ticks % 6 === 0)) {
        void this.refresh();
      }
    }, REFRESH_MS);
  }

  protected onBeforeDetach(msg: Message): void {
    window.clearInterval(this._timer);
    super.onBeforeDetach(msg);
  }

  async refresh(): Promise<void> {
    let jobs: Job[];
    const submissions = this._submissions;
    try {
      jobs = (await api<{ jobs: Job[] }>('GET', 'jobs')).jobs;
    } catch (error) {
      this._say((error as Error).message, 'error');
      return;
    }
    if (submissions !== this._submissions) {
      return;  // asked for before a job was submitted: it may show an older job of the same id (refresh follows)
    }
    const before = this._jobs;
    this._jobs = new Map(jobs.map(job => [job.job_id, job]));
    for (const job of jobs) {
      const was = before.get(job.job_id);
      if (was && !was.finished && job.finished) {
        tellEnded(job);
      }
    }
    this._rows.textContent = '';
    for (const job of jobs) {
      const row = this._rows.insertRow();
      row.dataset.jobId = String(job.job_id);
      row.classList.toggle('dsportal-mod-following', job.job_id === this._following);
      const ranks = job.kind === 'notebook' ? (job.runs > 1 ? `${job.runs} runs` : 'notebook') : job.ranks;
      for (const value of [job.job_id, job.name, job.state, job.nodes, ranks, job.image || '-']) {
        row.insertCell().textContent = String(value);
      }
      row.cells[2].className = `dsportal-state dsportal-state-${job.state.split(' ')[0]}`;
      row.cells[2].title = job.reason ? `${job.state} (${job.reason})` : job.state;
      // Which of the user's sessions launched it (she may run several at once).
      const launchedFrom = job.schedule
        ? `schedule ${job.schedule}`
        : job.from_this_session
        ? 'this one'
        : job.session_job === null
          ? '-'
          : `${job.session || 'default'} (job ${job.session_job})`;
      row.insertCell().textContent = launchedFrom;
      const actions = row.insertCell();
      const view = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-view', text: 'Log' });
      view.onclick = () => this.follow(job.job_id);
      actions.append(view);
      if (job.kind === 'notebook' && job.runs === 1) {
        const open = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-open', text: 'Notebook' });
        open.title = 'The executed notebook, outputs included (saved after each cell)';
        open.onclick = () => this._openNotebook(job.job_id, 'output.ipynb');
        const compare = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-compare', text: 'Compare' });
        compare.title = 'The executed notebook beside the copy that was submitted';
        compare.onclick = async () => {
          if (await this._openNotebook(job.job_id, 'output.ipynb')) {
            await this._openNotebook(job.job_id, 'input.ipynb', 'split-right');
          }
        };
        actions.append(open, compare);
      } else if (job.kind === 'notebook') {
        const results = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-results', text: 'Results' });
        results.title = "Each run's parameters, state and results; its executed notebook";
        results.onclick = () => void this._showResults(job.job_id);
        actions.append(results);
      }
      if (!job.finished) {
        const cancel = element('button', { class: 'jp-Button jp-mod-styled jp-mod-warn dsportal-Jobs-cancel', text: 'Cancel' });
        cancel.onclick = () => void this._cancel(job.job_id);
        actions.append(cancel);
      }
    }
    if (this._following !== null && this._jobs.has(this._following) && !this._logState.classList.contains('dsportal-state')) {
      this._logState.textContent = this._jobs.get(this._following)!.state;
    }
    state.jobs = jobs.length;
    await this._refreshSchedules();
  }

  private async _refreshSchedules(): Promise<void> {
    const asked = ++this._schedulesAsked;
    let schedules: Schedule[];
    try {
      schedules = (await api<{ schedules: Schedule[] }>('GET', 'schedules')).schedules;
    } catch {
      return;  // the jobs' own refresh says what is wrong
    }
    if (asked !== this._schedulesAsked) {
      return;  // a later refresh (e.g. after a delete) answers; this older list must not bring a deleted row back
    }
    this._schedulesSection.hidden = schedules.length === 0;
    this._scheduleRows.textContent = '';
    for (const s of schedules) {
      const row = this._scheduleRows.insertRow();
      row.dataset.scheduleId = s.id;
      row.title = s.description;
      row.insertCell().textContent = s.notebook.split('/').pop() || s.notebook;
      row.insertCell().textContent = s.words;
      const next = row.insertCell();
      next.textContent = s.paused ? 'paused' : s.next || '-';
      if (s.problem) {
        next.append(element('div', { class: 'dsportal-Jobs-scheduleProblem', text: s.problem }));
      }
      const runs = row.insertCell();
      runs.textContent = String(s.runs);
      if (s.last_run !== null) {
        const lastRun = s.last_run;
        const last = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-lastRun', text: `Log` });
        last.dataset.jobId = String(lastRun);
        last.title = `The latest run's log (job ${lastRun})`;
        last.onclick = () => this.follow(lastRun);
        runs.append(' ', last);
      }
      const actions = row.insertCell();
      const pause = element('button', {
        class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-pause',
        text: s.paused ? 'Resume' : 'Pause'
      });
      pause.onclick = () => void this._changeSchedule(s, 'PATCH', { paused: !s.paused });
      const remove = element('button', { class: 'jp-Button jp-mod-styled jp-mod-warn dsportal-Jobs-deleteSchedule', text: 'Delete' });
      remove.title = 'No more runs; the runs so far stay in My jobs';
      remove.onclick = () => void this._changeSchedule(s, 'DELETE');
      actions.append(pause, remove);
    }
    state.schedules = schedules.length;
  }

  private async _changeSchedule(s: Schedule, method: string, body?: unknown): Promise<void> {
    let said: [string, 'ok' | 'error'];
    try {
      await api(method, `schedules/${s.id}`, body);
      const done = method === 'DELETE' ? 'deleted' : (body as { paused: boolean }).paused ? 'paused' : 'resumed';
      said = [`The schedule of ${s.notebook} (${s.words}) is ${done}.`, 'ok'];
    } catch (error) {
      said = [(error as Error).message, 'error'];
    }
    await this._refreshSchedules();  // the list shows the change by the time the message says it
    this._say(...said);
  }

  /** Open a job's notebook; why not, in the panel's message (e.g. no cell has run yet). */
  private async _openNotebook(jobId: number, name: string, mode?: string): Promise<boolean> {
    try {
      await api('GET', `jobs/${jobId}/files/${encodeURIComponent(name)}`);  // its reason in words, if refused
      await this._open(jobFile(jobId, name), mode);
      return true;
    } catch (error) {
      this._say((error as Error).message, 'error');
      return false;
    }
  }

  private async _showResults(jobId: number): Promise<void> {
    let table: Results;
    try {
      table = await api<Results>('GET', `jobs/${jobId}/results`);
    } catch (error) {
      this._say((error as Error).message, 'error');
      return;
    }
    const head = element('tr', {}, ...table.columns.map(c => element('th', { text: c === 'output' ? '' : c })));
    const body = element('tbody');
    for (const row of table.rows) {
      const tr = body.insertRow();
      for (const column of table.columns) {
        const cell = tr.insertCell();
        if (column === 'output') {
          const open = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject', text: 'Notebook' });
          open.onclick = () => this._openNotebook(jobId, String(row.output));
          cell.append(open);
        } else {
          cell.textContent = row[column] === undefined ? '' : typeof row[column] === 'string' ? String(row[column]) : JSON.stringify(row[column]);
          cell.dataset.value = cell.textContent;
        }
      }
    }
    const results = element('table', { class: 'dsportal-Jobs-table dsportal-Jobs-resultsTable' }, element('thead', {}, head), body);
    head.querySelectorAll('th').forEach((th, index) => {
      th.onclick = () => sortBy(body, index);
      th.title = 'Sort by this column';
    });
    const csv = element('a', { href: sessionUrl('dsportal/api/jobs', String(jobId), 'results') + '?format=csv', download: `job-${jobId}-results.csv`, text: 'Download CSV' });
    this._results.textContent = '';
    this._results.append(element('h2', { text: `Results of job ${jobId}` }), csv, element('div', { class: 'dsportal-Jobs-tableScroll' }, results));
    this._results.hidden = false;
  }

  private async _loadPolicy(): Promise<void> {
    try {
      this._policy = await api<Policy>('GET', 'policy');
    } catch (error) {
      this._say(`Jobs cannot be launched from this session: ${(error as Error).message}`, 'error');
      return;
    }
    const profile = this._controls.profile;
    profile.textContent = '';
    for (const p of this._policy.profiles) {
      option(profile, p.name, p.display_name);
    }
    profile.value = this._policy.default_profile;
    this._showProfile();
    state.jobsPolicy = true;
  }

  private _showProfile(): void {
    const c = this._controls;
    const profile = this._policy?.profiles.find(p => p.name === c.profile.value);
    if (!profile || !this._policy) {
      return;
    }
    c.gpus_per_node.textContent = '';
    c.image.textContent = '';
    for (const n of profile.gpu_choices) {
      option(c.gpus_per_node, String(n), String(n));
    }
    c.gpus_per_node.value = String(profile.default_gpus);
    option(c.image, '', 'session Python (no container)');
    for (const image of this._policy.images) {
      if (!image.profiles.length || image.profiles.includes(profile.name)) {
        option(c.image, image.name, image.display_name);
      }
    }
    c.walltime.placeholder = profile.jobs.default_walltime;
  }

  private _isNotebook(): boolean {
    return this._controls.script.value.trim().endsWith('.ipynb');
  }

  private _showKind(): void {
    const notebook = this._isNotebook();
    const show = (label: HTMLLabelElement, shown: boolean) => {
      label.hidden = !shown;
      // a hidden field neither blocks the form's checks nor is sent
      label.querySelectorAll('input, select').forEach(control => ((control as HTMLInputElement).disabled = !shown));
    };
    show(this._nodesField, !notebook);
    show(this._launcherField, !notebook);
    for (const f of this._notebookFields) {
      show(f, notebook);
    }
  }

  private async _launch(): Promise<void> {
    const c = this._controls;
    const path = c.script.value.trim();
    let request: { [key: string]: unknown };
    if (this._isNotebook()) {
      request = { notebook: path, profile: c.profile.value, gpus_per_node: Number(c.gpus_per_node.value) };
      for (const [key, control] of [['parameters', c.parameters], ['grid', c.grid]] as [string, HTMLInputElement][]) {
        if (!control.value.trim()) {
          continue;
        }
        try {
          request[key] = JSON.parse(control.value);
        } catch {
          this._say(`${key} must be JSON, e.g. ${control.placeholder}`, 'error');
          return;
        }
      }
      if (c.max_running.value) {
        request.max_running = Number(c.max_running.value);
      }
      if (c.mail.checked) {
        request.mail = true;
      }
      if ('Notification' in window && Notification.permission === 'default') {
        void Notification.requestPermission();  // to be told when it ends, in another tab too
      }
    } else {
      request = {
        script: path,
        profile: c.profile.value,
        nodes: Number(c.nodes.value),
        gpus_per_node: Number(c.gpus_per_node.value),
        launcher: c.launcher.value
      };
    }
    if (c.image.value) {
      request.image = c.image.value;
    }
    if (c.walltime.value.trim()) {
      request.walltime = c.walltime.value.trim();
    }
    const when = this._isNotebook() ? c.schedule.value.trim() : '';
    if (when) {
      request.schedule = when;
      this._say('Scheduling…', 'info');
      try {
        const { schedule } = await api<{ schedule: Schedule }>('POST', 'schedules', request);
        this._say(`Scheduled ${schedule.notebook}: ${schedule.words}, next run ${schedule.next}. Each run is a job of its own in My jobs.`, 'ok');
        await this._refreshSchedules();
      } catch (error) {
        this._say((error as Error).message, 'error');
      }
      return;
    }
    this._say('Submitting…', 'info');
    try {
      const { job } = await api<{ job: Job }>('POST', 'jobs', request);
      this._say(`Submitted job ${job.job_id}: ${job.description}`, 'ok');
      // Job ids come round again (a cluster whose Slurm state was reset, a wrap-around): a row of an older
      // job of hers with this id is not this job, and goes before the list is asked for again.
      this._submissions++;
      for (const row of Array.from(this._rows.rows)) {
        if (row.dataset.jobId === String(job.job_id)) {
          row.remove();
        }
      }
      this._jobs.set(job.job_id, job);
      this.follow(job.job_id);
      await this.refresh();
    } catch (error) {
      this._say((error as Error).message, 'error');
    }
  }

  private async _cancel(jobId: number): Promise<void> {
    try {
      await api('DELETE', `jobs/${jobId}`);
      this._say(`Job ${jobId} is being cancelled.`, 'ok');
    } catch (error) {
      this._say((error as Error).message, 'error');
    }
    await this.refresh();
  }

  private _onEvent(jobId: number, event: StreamEvent): void {
    if (event.type === 'job') {
      this._jobs.set(jobId, event.job);
      this._resetFilter(event.job.ranks, event.job.runs);
      this._logState.textContent = event.job.state;
    } else if (event.type === 'line') {
      this._append(event.rank, event.stream, event.line);
    } else if (event.type === 'state') {
      const known = this._jobs.get(jobId);
      if (known && !known.finished) {
        const ended = { ...known, state: event.state, reason: event.reason, finished: true };
        this._jobs.set(jobId, ended);  // told once: the next refresh sees it ended already
        tellEnded(ended);
      }
      // An array's tasks each have their own exit code: Slurm gives the array none.
      const text = `job ${jobId}: ${event.state}` + (event.exit_code ? ` (exit code ${event.exit_code})` : '');
      this._append(null, 'state', text);
      this._logState.textContent = text;
      this._logState.className = `dsportal-Jobs-logState dsportal-state dsportal-state-${event.state.split(' ')[0]}`;
      void this.refresh();
    }
  }

  private _append(rank: number | null, stream: string, text: string): void {
    const who = rank === null ? 'batch' : String(rank);
    const label = rank === null ? 'batch' : stream === 'task' ? `run ${rank}` : `rank ${rank}`;
    const line = element('div', {
      class: `dsportal-Jobs-line dsportal-Jobs-${stream}`,
      'data-rank': who,
      text: stream === 'state' || stream === 'error' ? text : `[${label}] ${text}`
    });
    line.hidden = !this._shows(who, stream);
    const log = this._log;
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 5;
    log.append(line);
    if (atEnd) {
      log.scrollTop = log.scrollHeight;
    }
  }

  private _shows(who: string, stream: string): boolean {
    const wanted = this._rankFilter.value;
    return wanted === 'all' || stream === 'state' || stream === 'error' || who === wanted;
  }

  private _resetFilter(ranks: number, runs = 0): void {
    const select = this._rankFilter;
    const kept = select.value || 'all';
    select.textContent = '';
    option(select, 'all', runs > 1 ? 'all runs' : 'all ranks');
    option(select, 'batch', 'batch script');
    // a notebook's one run has the batch log only; a grid's runs their own logs; a multi-node job its ranks
    for (let rank = 0; rank < (runs > 1 ? runs : runs === 1 ? 0 : ranks); rank++) {
      option(select, String(rank), runs > 1 ? `run ${rank}` : `rank ${rank}`);
    }
    select.value = Array.from(select.options).some(o => o.value === kept) ? kept : 'all';
    this._applyFilter();
  }

  private _applyFilter(): void {
    for (const line of Array.from(this._log.children) as HTMLElement[]) {
      const stream = line.classList.contains('dsportal-Jobs-state') ? 'state' : line.classList.contains('dsportal-Jobs-error') ? 'error' : '';
      line.hidden = !this._shows(line.dataset.rank || 'batch', stream);
    }
  }

  private _say(text: string, kind: 'info' | 'ok' | 'error'): void {
    this._message.textContent = text;
    this._message.className = `dsportal-Jobs-message dsportal-Jobs-${kind}`;
  }

  private _controls = {
    script: element('input', { name: 'script' }),
    profile: element('select', { name: 'profile' }),
    nodes: element('input', { name: 'nodes' }),
    gpus_per_node: element('select', { name: 'gpus_per_node' }),
    launcher: element('select', { name: 'launcher' }),
    image: element('select', { name: 'image' }),
    walltime: element('input', { name: 'walltime' }),
    parameters: element('input', { name: 'parameters' }),
    grid: element('input', { name: 'grid' }),
    max_running: element('input', { name: 'max_running' }),
    mail: element('input', { name: 'mail' }),
    schedule: element('input', { name: 'schedule' })
  };
  private _open: (path: string, mode?: string) => Promise<unknown>;
  private _nodesField: HTMLLabelElement;
  private _launcherField: HTMLLabelElement;
  private _notebookFields: HTMLLabelElement[];
  private _results = element('section', { class: 'dsportal-Jobs-results' });
  private _schedulesSection = element('section', { class: 'dsportal-Jobs-schedulesSection' });
  private _scheduleRows = element('tbody');
  private _schedulesAsked = 0;
  private _form = element('form', { class: 'dsportal-Jobs-form' });
  private _message = element('div', { class: 'dsportal-Jobs-message' });
  private _rows = element('tbody');
  private _logTitle = element('h2', { text: 'Log' });
  private _logState = element('span', { class: 'dsportal-Jobs-logState' });
  private _rankFilter = element('select', { class: 'dsportal-Jobs-rankFilter' });
  private _log = element('div', { class: 'dsportal-Jobs-log' });
  private _policy: Policy | null = null;
  private _jobs = new Map<number, Job>();
  private _submissions = 0;  // jobs submitted from this panel: a list asked for before the last one is not shown
  private _following: number | null = null;
  private _socket: WebSocket | null = null;
  private _timer = 0;
}

/** Sort a results table's rows by one column: numbers as numbers, again to reverse. */
function sortBy(body: HTMLTableSectionElement, index: number): void {
  const rows = Array.from(body.rows);
  const value = (row: HTMLTableRowElement) => row.cells[index]?.dataset.value ?? '';
  const numeric = rows.every(row => value(row) === '' || !isNaN(Number(value(row))));
  const ascending = body.dataset.sortedBy !== String(index);
  rows.sort((a, b) => {
    const order = numeric ? Number(value(a)) - Number(value(b)) : value(a).localeCompare(value(b));
    return ascending ? order : -order;
  });
  body.dataset.sortedBy = ascending ? String(index) : '';
  body.append(...rows);
}

/** A job ended while this page watched it: a browser notification (when allowed), else nothing more
 * than the table's new state. */
function tellEnded(job: Job): void {
  state.lastEnded = { job_id: job.job_id, state: job.state };
  if ('Notification' in window && Notification.permission === 'granted') {
    new Notification(`Job ${job.job_id} ${job.state.toLowerCase()}`, { body: `${job.name}: ${job.reason || job.description}` });
  }
}
